package settle

// Free is the bytes of m's bound in all that nothing holds.
func (m *BodyMemory) Free() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.free
}

// HeldBy is the bytes that client holds of m.
func (m *BodyMemory) HeldBy(client string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held[client]
}

// Buffer is the capacity of the buffer that holds rec's JSON body, and
// the bytes reserved for it.
func (rec *Recorder) Buffer() (capacity int, reserved int64) {
	return cap(rec.json.b), rec.json.held
}
