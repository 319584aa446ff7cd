"""What a method's programs cost to get ready: compile seconds, executable bytes, load seconds."""
