"""Reference models (plain nn.Modules) and the builder."""
