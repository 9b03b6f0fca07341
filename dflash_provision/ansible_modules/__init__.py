"""The controller side of the ``dflash.provision`` Ansible collection: what its action plugins
call. Each function takes the play's own connection as a shell runner (``transport.callback``)
and runs this project's remote protocol through it, so a playbook gets exactly the CLI's
guarantees; nothing here imports Ansible (the plugins in ``ansible_collections/`` are thin)."""
