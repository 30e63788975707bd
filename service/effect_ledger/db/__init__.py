"""Everything that talks to PostgreSQL."""
