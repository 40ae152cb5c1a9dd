"""records: the versioned results schema, strict loading, atomic appends."""
