"""TokenSwift-style generation to thousands of tokens: speed and tau as the output grows."""
