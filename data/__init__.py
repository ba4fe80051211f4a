"""The SQLite store, domain records, importers/exporters and bundled datasets."""
