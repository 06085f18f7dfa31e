"""Drafter plug-ins for the tests, written to the contract a plug-in outside the engine package holds to
(backend/specgram/drafting/plugins.py): each module defines DRAFTERS, the declarations the `drafter_plugins`
setting registers, and the function each declaration's `make` names.

Their drafts are one token, TOKEN, repeated: a request that bans TOKEN (logit_bias -100) rejects every one of them,
so their acceptance is known in advance, and their declared priors (0: never expected to be accepted) decide alone
whether num_draft_tokens auto verifies any."""

TOKEN = 5  # a token id every test vocabulary has
