"""Who may reach the faces on whose behalf: API tokens and tenant portal links."""
