from poller.cli import main

main()
