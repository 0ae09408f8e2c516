"""What a study is: the spec (YAML + key=value overrides -> a frozen, validated StudySpec) and
finding the experiment module it names. Imports nothing of hpolab above errors/train."""
