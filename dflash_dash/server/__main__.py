"""`python -m dflash_dash.server --model DIR ...`: the local SGLang stand-in server (see `options.main`)."""

from .options import main

main()
