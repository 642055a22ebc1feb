"""Text made safe and short: control characters escaped, strings from the OS kept lossless, titles
cut at a word."""
