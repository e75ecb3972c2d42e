# Guest PCI topologies for scripts/vm-test (sourced). Each topology_<name> function appends QEMU
# arguments to the QEMU_ARGS array; the test suite learns the name from the kernel command line
# (vmtest.topology=<name>) and checks what that topology promises.
#
# Device facts (measured with QEMU 10.0 in the test guest): igb is an 82576 SR-IOV PF whose VFs appear at
# 01:10.0, 01:10.2, ... (8086:10ca); QEMU's nvme emulates SR-IOV secondary controllers when given
# sriov_max_vfs, and needs max_ioqpairs - sriov_vq_flexible >= 2 (hw/nvme/ctrl.c parameter checks).
# igb without a netdev only warns "nic has no peer".

# Slots on pcie.0 are pinned (addr=) so the guest's PCI addresses and IOMMU group numbers do not
# depend on argument order: the simulated host mdev-types/sims/samples.toml mirrors this layout
# (00:01.0 the 9p share, see scripts/vm/lib.sh; 00:02.0 and 00:03.0 root ports; 00:1f.* the q35
# chipset; IOMMU groups numbered in that order).

# Two SR-IOV PFs, each behind its own PCIe root port so each is alone in its IOMMU group.
topology_default() {
	QEMU_ARGS+=(
		-device pcie-root-port,id=rp1,chassis=1,slot=1,addr=2.0
		-device igb,bus=rp1
		-device pcie-root-port,id=rp2,chassis=2,slot=2,addr=3.0
		-drive if=none,id=nvm0,file=null-co://,file.size=64M,format=raw
		-device nvme-subsys,id=subsys0,nqn=vgpu-vmtest
		-device nvme,serial=vmtest0,bus=rp2,subsys=subsys0,sriov_max_vfs=2,sriov_vq_flexible=4,sriov_vi_flexible=2,max_ioqpairs=6,msix_qsize=4
		-device nvme-ns,drive=nvm0,shared=false
	)
}

# The default devices plus two conventional PCI devices behind a PCIe-to-PCI bridge. The IOMMU sees
# every transaction from behind such a bridge with the bridge's requester ID, so the kernel puts the
# bridge and both devices into one IOMMU group (drivers/iommu/iommu.c pci_device_group, via
# pci_for_each_dma_alias in drivers/pci/search.c). The devices are QEMU's "edu" teaching device
# (1234:11e8, conventional PCI, with a DMA engine that later VFIO tests can drive).
topology_shared_group() {
	topology_default
	QEMU_ARGS+=(
		-device pcie-root-port,id=rp3,chassis=3,slot=3,addr=4.0
		-device pcie-pci-bridge,id=br1,bus=rp3
		-device edu,bus=br1,addr=1.0
		-device edu,bus=br1,addr=2.0
	)
}
