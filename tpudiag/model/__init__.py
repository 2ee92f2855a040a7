"""The typed core: trace tables and their schemas, device facts, findings and the report."""
