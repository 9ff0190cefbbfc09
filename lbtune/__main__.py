from lbtune.cli import main

main()
