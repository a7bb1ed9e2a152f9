"""What the cloud does for its routes, one keyword-only function per action: the routes parse, authorise and
call these."""
