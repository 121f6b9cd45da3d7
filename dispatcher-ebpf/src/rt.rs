//! What every program object of this crate needs: a panic handler (never reached: the
//! verifier rejects a program with a reachable panic) and the licence section.

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
