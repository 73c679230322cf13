"""The output toolkit: tables that fit the terminal, the HTML shell and page, JUnit, and the check report in words.
Every command renders through it; it knows reports and sites, not how they were checked."""
