// runc-caps: a runc wrapper for machines whose capability bounding set lacks some capabilities
// (see main.go). Standard library only.
module rlkube.local/runccaps

go 1.24.0
