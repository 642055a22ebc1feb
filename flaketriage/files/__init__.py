"""Local files: atomic writes, the file lock and the modes of what flaketriage writes."""
