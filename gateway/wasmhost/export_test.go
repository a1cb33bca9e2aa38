package wasmhost

// SetNextStreamID lets tests start a VM's stream ids near the wrap.
func SetNextStreamID(vm *VM, id uint32) { vm.nextID = id }

// StreamID is s's context id.
func StreamID(s *Stream) uint32 { return s.id }
