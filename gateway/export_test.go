package gateway

// BodyModel exposes bodyModel to the fuzz test.
func BodyModel(body []byte) (string, string) {
	m, o := bodyModel(body)
	return m, string(o)
}
