"""`python -m vivace`: the same as the `vivace` command."""

from vivace.cli import main

main()
