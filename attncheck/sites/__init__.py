"""A printed attention site seen per head ([H, T, n_kv] scores and weights, [H, T, D_h] outputs) and what SOFT_MAX
added to each score under the site's facts: what the dump-only checks, inspect and the HTML page all read."""
