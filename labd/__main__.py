from labd.cli import main

main()
