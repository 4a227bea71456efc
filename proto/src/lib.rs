//! Placeholder; generated code lands here.
