"""The MXNet frontend: GluonCV zoo names and symbol files -> Relax (a converter per MXNet op)."""
