# Push triggers and their events arrive with the triggers issue (/api/events).
