"""Holds relayrl.models.chat alone, an older path of relayrl.plugins.chat; the model side is
relayrl_torch.models."""
