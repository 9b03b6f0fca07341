from dflash_provision.cli.entry import main

main()
