"""jaxpod.models: model families (trm/, llama/); each annotates logical axes, never mesh axes."""
