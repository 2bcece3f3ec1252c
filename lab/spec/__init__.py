"""The lab's input formats: topologies and fault scenarios, read strictly with named errors."""
