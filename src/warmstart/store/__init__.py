"""What lives on the volume: the layout, each key's records, staged bundles and generations."""
