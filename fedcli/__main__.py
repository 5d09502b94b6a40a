from fedcli.cli import main

main()
