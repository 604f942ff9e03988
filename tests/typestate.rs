//! Compile-fail tests: the typestate rules are enforced by the compiler.
#![cfg(feature = "sim")]

#[test]
fn typestate_rules_do_not_compile_when_broken() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
