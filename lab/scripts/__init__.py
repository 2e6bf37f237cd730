"""Scripts run from a source checkout: the runs behind the README's tables (`readme_tables.sh`,
`gpu_check.sh`), the real vocabularies of the optional tests, and the README's server-error
table."""
