from tpudiag.cli.app import main

main()
