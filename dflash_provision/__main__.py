from dflash_provision.cli.main import main

main()
