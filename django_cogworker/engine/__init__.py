"""The worker engine: no Django import at module level; every object takes a Config."""
