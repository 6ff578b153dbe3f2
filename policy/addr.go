package policy

// CheckListen returns what is wrong with a listener's address, "" when it
// is one: host:port, the host optional, the port 0 to 65535. Load checks
// the file's addresses with it; serve checks those its flags give.
func CheckListen(addr string) string { return checkListen(addr) }
