from ._cli._console import console_main

console_main()
