"""The database: URLs and engines, migrations, the schema, and every statement (queries/).

The layers above never build SQL: they run a named statement from queries/.
"""
