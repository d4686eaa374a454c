"""The message store: connections, schema, migrations and the SQL every floor above shares."""
