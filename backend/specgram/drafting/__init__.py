"""What drafts are, shared by every floor that handles them: the drafters' declarations (registry), a
drafter's proposal for a request and a step (proposal), and the acceptance estimates per request and source
(acceptance). Nothing here drafts: the drafters and the planners are in specgram.speculation."""
