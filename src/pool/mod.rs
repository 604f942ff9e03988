//! A registered-memory pool (issue 15): one registered slab per protection domain, carved
//! by a fixed-capacity allocator. (Being written.)
