# Runs arrive with the runs issue (/_puppet/runs); the connection check below needs none yet.
