"""The command layer: one module per command. Each turns parsed options into calls of the library
and prints the result; a refusal (`MinigptError`) becomes one `minigpt: error:` line on stderr and
exit status 2. The library modules never print to stdout, exit or parse flags."""
