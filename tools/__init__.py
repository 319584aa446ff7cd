"""Developer tools run from a checkout (tools/README.md); the installed lsjax never imports them."""
