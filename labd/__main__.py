from labd.commands.main import main

main()
