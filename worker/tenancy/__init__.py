"""Who may do what, and what it costs them: tenants and keys, plans, budgets and the ledger,
admission and fairness."""
