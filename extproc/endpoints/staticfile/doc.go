// Package staticfile is the endpoints.Source for fleets without Kubernetes:
// a strict YAML file listing the pool's endpoints, watched for edits, each
// valid edit applied as one atomic membership change.
package staticfile
