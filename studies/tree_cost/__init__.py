"""What a verification forward of T nodes costs against a 1-token forward on this device."""
