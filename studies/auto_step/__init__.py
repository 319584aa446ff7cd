"""What one `auto` step costs: each candidate forced inside auto's loop against AR."""
