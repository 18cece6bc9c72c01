from selfspec.bench import main

main()
