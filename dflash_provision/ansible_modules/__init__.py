"""The library side of the ``dflash.provision`` Ansible collection's modules: what its action
plugins call (by name, ``dflash_provision.ansible_modules.<module>``). Each function takes the
play's own connection as a shell runner (``transport.callback``) and runs this project's remote
protocol through it, so a playbook gets exactly the CLI's guarantees; nothing here imports
Ansible (the plugins in ``ansible_collections/`` are thin)."""
