"""`fedcli run`: whole recipes, sweeps and model selection over the stages."""
