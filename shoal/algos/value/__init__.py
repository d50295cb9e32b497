"""Value-based learners: they learn action values and act (epsilon-)greedily on them. Tabular
TD control (`tabular`), DQN with every Rainbow part as a switch (`dqn`: also QR-DQN and REM),
and Ape-X's distributed prioritized replay around DQN's and DDPG's learners (`apex`)."""
