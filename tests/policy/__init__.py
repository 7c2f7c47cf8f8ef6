"""grammarspec/policy: draft allocation, the adaptive controller, the learned step cost."""
