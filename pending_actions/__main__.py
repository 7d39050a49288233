from pending_actions.cli import main

main()
